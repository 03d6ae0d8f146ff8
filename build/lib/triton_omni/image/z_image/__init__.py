"""Z-Image: its steps (steps.py) and the transformer's forward split once per group / per step (transformer.py)."""
