"""What is decided before a run: its config (schema, load, cross-field rules), the planner (does
the layout fit, memory, time, GPU-hours, goodput), the time budget and the pre-flight checks."""
