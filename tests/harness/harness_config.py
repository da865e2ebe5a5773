"""A small run's config for the harness (as tests/integration/runs.py's)."""

import json

from recsync.config import load_config

B = 64
SMALL = ["model.embedding_dim=4", "model.bottom_mlp=[8]", "model.top_mlp=[8]",
         f"train.batch_size={B}", "output.progress=false", "output.plot=false",
         # the harness fakes Ray's transport; the direct path is a real socket (ps/channel.py),
         # tested in tests/unit/test_channel.py and by every integration run
         'cluster.transport="ray"']


def config(data, *extra):
    return load_config(None, [f"data.path={json.dumps(str(data))}", *SMALL, *extra])
