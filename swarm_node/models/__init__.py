"""Models: loading any causal LM (local dir, preset name or hub id; dtype, device, LoRA) and the tiny
offline presets the demo and tests build themselves.
"""
