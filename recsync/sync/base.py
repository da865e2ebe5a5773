"""What every sync mode shares."""

STOP = "stop"
"""returned by ``step`` when no worker has data left: the run is over for everyone. A value, not
an ``object()``: Ray may serialize the worker class by value, and identity does not survive."""
