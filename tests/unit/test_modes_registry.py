"""MODES (recsync/modes/__init__.py) is the one list of the modes: the config's values of
``mode``, its modes' sections, its messages and the docs' lists come from it, and a new mode
is its module and one registry line. Without Ray:

    python -m pytest tests/unit/test_modes_registry.py -q
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch.nn.utils import parameters_to_vector

from recsync.config import ConfigError, RunConfig, RunConfigBase, load_config
from recsync.modes import LOCAL, MODES, Entry, Registry
from recsync.modes.base import ShardRule, WorkerContext, WorkerMode, contract_gaps

REPO = Path(__file__).resolve().parents[2]


def test_an_unknown_mode_is_refused_in_one_line_that_lists_every_mode_of_the_registry():
    with pytest.raises(ConfigError) as e:
        load_config(None, ['mode="hogwild"'])
    line = next(x for x in str(e.value).splitlines() if x.strip().startswith("mode:"))
    assert "'hogwild'" in line
    assert re.findall(r"'(\w+)'", line.split("(got")[0]) == [LOCAL, *MODES]


def test_looking_up_an_unknown_mode_names_the_modes():
    with pytest.raises(ValueError, match="unknown mode 'hogwild': the modes are "
                       + ", ".join(MODES)):
        MODES["hogwild"]
    assert MODES.get(LOCAL) is None  # local is no Mode: a summary asks without failing


@pytest.mark.parametrize("name", list(MODES))
def test_every_registered_mode_loads_under_its_name_complete(name):
    mode = MODES[name]
    assert mode.name == name
    assert contract_gaps(mode) == []


@pytest.mark.parametrize("name", list(MODES))
def test_every_mode_builds_its_rules_and_worker_half_from_a_config_of_that_mode(name):
    """What a shard and a worker make first: it reads the mode's section, so a mode whose code
    needs a section its registry line does not give fails here."""
    cfg = load_config(None, [f'mode="{name}"', "cluster.workers=2", "cluster.ps_shards=2"])
    model = torch.nn.Linear(2, 1)
    dense = parameters_to_vector(model.parameters()).detach().numpy()
    mode = MODES[name]
    for shard in range(2):
        assert isinstance(mode.make_rule(cfg, shard, dense if shard == 0 else None), ShardRule)
    ctx = WorkerContext(rank=0, cfg=cfg, model=model, client=None, new_client=lambda: None,
                        shards=[None, None])
    assert isinstance(mode.worker(ctx), WorkerMode)
    assert mode.samples_per_update(cfg) >= cfg.train.batch_size


def test_the_config_has_exactly_the_sections_the_registry_names():
    named = {entry.section[0]: entry.section[1] for entry in MODES.entries.values()
             if entry.section}
    added = set(RunConfig.model_fields) - set(RunConfigBase.model_fields)
    assert added == set(named)
    for key, where in named.items():
        section = RunConfig.model_fields[key].annotation
        assert f"{section.__module__}:{section.__qualname__}" == where
        assert getattr(RunConfig(), key) == section()  # every section has its defaults


def test_the_schema_and_the_readme_list_every_mode():
    schema = RunConfig.model_json_schema()["properties"]["mode"]
    assert schema["enum"] == [LOCAL, *MODES]
    for name in schema["enum"]:
        assert f'"{name}" (' in schema["description"]
    readme = (REPO / "README.md").read_text()
    listing = re.search(r'^mode = "async" +#(.*\n(?: +#.*\n)*)', readme, re.M)
    assert listing, "README.md's [cluster] example no longer lists the modes after mode = \"async\""
    assert re.findall(r'"(\w+)"', listing.group(1)) == [LOCAL, *MODES]


def test_messages_that_list_modes_take_them_from_the_registry():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["faults.kill_mean_s=10.0"])
    for name in MODES:
        assert f'"{name}"' in str(e.value)
    switchable = [n for n, m in MODES.items() if m.switchable]
    stays = next(n for n, m in MODES.items() if not m.switchable)
    with pytest.raises(ConfigError, match=f"mode '{stays}' cannot switch") as e:
        load_config(None, [f'mode="{stays}"', "switching.auto=true"])
    assert re.findall(r'"(\w+)"', str(e.value).split("between")[1]) == switchable
    with pytest.raises(ConfigError, match=rf"schedule\[0\].to = \"{stays}\""):
        load_config(None, [f'mode="{switchable[0]}"',
                           f'switching.schedule=[{{to="{stays}", at_s=1.0}}]'])


def test_a_registry_line_that_points_at_the_wrong_class_fails_at_lookup():
    with pytest.raises(TypeError, match="whose name is 'sync': a mode's name is its key"):
        Registry({"other": Entry("recsync.modes.sync:Sync", "sync by another name")})["other"]
    with pytest.raises(TypeError, match="not a Mode"):
        Registry({"rule": Entry("recsync.modes.sync:StepBarrier", "a rule")})["rule"]
    shadow = ("shadow", "recsync.modes.sections:ShadowConfig")
    with pytest.raises(TypeError, match=r"\[shadow\] is recsync.modes.sections:GBAConfig"):
        Registry({"a": Entry("m:A", "a", shadow),
                  "b": Entry("m:B", "b", ("shadow", "recsync.modes.sections:GBAConfig"))
                  }).sections()


NEW_MODE = '''
from recsync.config_sections import Section
from recsync.modes.async_ps import ApplyNow, AsyncWorker
from recsync.modes.base import Mode


class StepsConfig(Section):
    steps_per_push: int = 1
    """pushes every this many steps"""


class Steps(Mode):
    name = "steps"
    worker = AsyncWorker
    dense_on_ps = True

    @classmethod
    def make_rule(cls, cfg, shard, dense_init):
        return ApplyNow()
'''

REGISTER_AND_USE = '''
import sys
from recsync.modes import MODES, Entry
MODES.entries["steps"] = Entry("steps_mode:Steps", "pushes every k steps",
                               ("steps", "steps_mode:StepsConfig"))  # its registry line
from recsync.config import ConfigError, load_config
cfg = load_config(None, ['mode="steps"', "steps.steps_per_push=3"])
assert (cfg.mode, cfg.steps.steps_per_push, cfg.distributed) == ("steps", 3, True)
assert MODES["steps"].dense_on_ps
try:
    load_config(None, ['mode="hogwild"'])
except ConfigError as e:
    assert "'steps'" in str(e), str(e)
print("ok")
'''


def test_a_new_mode_is_its_module_and_one_registry_line(tmp_path):
    """A mode defined outside recsync, and registered by one line, is a valid config mode with
    its section, in the error's list, and found by the driver's lookup: config.py is not
    edited (another process: the registry line must come before config.py is imported)."""
    (tmp_path / "steps_mode.py").write_text(textwrap.dedent(NEW_MODE))
    env = {"PYTHONPATH": f"{REPO}:{tmp_path}", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", REGISTER_AND_USE], capture_output=True,
                         text=True, env=env, cwd=tmp_path, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "ok"
