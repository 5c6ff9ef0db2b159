"""`runctl`: a thin CLI over the orchestrator library (parse, call, print, map errors to exit codes)."""
