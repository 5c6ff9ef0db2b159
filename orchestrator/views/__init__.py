"""What a person reads of a run, from its records only (never the controller's internals): the
status screen and dashboard, `runctl doctor`, the Prometheus metrics, the reports, goodput, the
training-health report and plot, and every event as a sentence (event_text/)."""
