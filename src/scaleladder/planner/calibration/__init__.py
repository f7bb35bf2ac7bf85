"""Measured rates per device (one JSON file each) and the datasheet fallback: data read by ``planner/rates.py``."""
