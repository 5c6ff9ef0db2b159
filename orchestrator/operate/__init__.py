"""What an operator does to a run: prepare and submit it (runs.py), ask its controller to kill,
resume, roll back or clear nodes (requests.py), and run auxiliary jobs on it (auxjobs.py)."""
