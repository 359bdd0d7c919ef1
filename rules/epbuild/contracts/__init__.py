"""What crosses a process or a run, declared once: a job's request and answer, the statuses and verdicts that
build-report.json, validation.json and the reports carry, and the artifact record (`artifact.json`)."""
