"""`recsync tune`: a search over config keys on Ray Tune with ASHA (docs/tune.md).

space.py reads the search space file (no Ray); trial.py is one trial, in Ray Tune's process;
table.py keeps and writes the table of trials; report.py the plot and the best config;
search.py puts them together (``tune``); command.py is the click command.
"""

from recsync.tuning.search import TuneResult, tune

__all__ = ["TuneResult", "tune"]
