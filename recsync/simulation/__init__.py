"""A virtual cluster: hundreds of workers with real gradients on a simulated clock
(docs/simulate.md). ``simulate`` (simulation/run.py) is the entry; `recsync simulate` its
command; ``recsync.simulate`` (api.py) its Python call. (The package is not named ``simulate``:
importing it would hide that call, an attribute of ``recsync`` of the same name.)

    clock.py    the discrete-event queue and the simulated processes it runs
    timing.py   the model of time: compute cost, worker speeds, messages, shard service
    shards.py   ShardCore behind a shard-shaped handle whose calls take simulated time
    client.py   PSClient waiting on the simulated clock; the simulated all-reduce
    workers.py  the worker loop as a simulated process, running the mode's worker half
    run.py      the run: build, run the clock, metrics lines and evaluations, the end
    output.py   summary.json (labelled SIMULATED, real times beside) and the console lines
    command.py  the `recsync simulate` command
"""

from __future__ import annotations


def simulate(*args, **kwargs):
    """recsync.simulation.run.simulate (imported on first use: it imports torch)."""
    from recsync.simulation.run import simulate as run
    return run(*args, **kwargs)
