"""What a rung leaves behind: the HDF5 record (``store``), the OOM record's schema
(``records``), and the ladder file that merges them (``aggregate``).
Imports from: spec and models only, so every stage above can write or read results.
"""
