"""Measured rates per device (one JSON file each) and the measured host table: data read by ``planner/rates.py``.

Only what was measured: a device's datasheet figures are the device table's (``planner/devices.py``).
"""
