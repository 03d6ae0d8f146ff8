"""Ensemble YAML -> model repository (config.pbtxt + model.py per step), and tiny demo checkpoints."""
