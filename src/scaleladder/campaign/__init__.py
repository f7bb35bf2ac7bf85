"""Rungs as a campaign sees them: start one under a launcher and record an OOM as a
result (``supervise``), search the largest batch that fits (``maxbatch``).
Imports from: rung, planner, results, and below.
"""
