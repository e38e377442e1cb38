"""Launching, watching and summarising many node processes: the local swarm, the live table, the report.

Used by `swarm-node demo`, `swarm-node report` and the multi-process tests; a node process never imports it.
"""
