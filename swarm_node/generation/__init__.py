"""generation package."""
