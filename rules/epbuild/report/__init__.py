"""What people see: the build report, report.html / junit.xml / step summary, live progress, the task graph."""
