"""One run's life: run() (driver.py), the local run, the checks before it, how it ends, what
it records and what it writes."""
