"""BAGEL text to image: its steps (steps.py) over the model in plain torch (model.py)."""
