"""Preprocessing: decode, orient, resize and encode images (picklable work units in task.py)."""
