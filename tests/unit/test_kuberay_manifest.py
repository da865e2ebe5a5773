"""docs/cluster.md's KubeRay RayJob (not run here: no Kubernetes) is a manifest kubectl can
read, runs `recsync train`, and gives every Ray container the same token authentication (Ray
2.60's head turns it on; a node without the token is refused)."""

from pathlib import Path

import yaml

DOC = Path(__file__).resolve().parents[2] / "docs" / "cluster.md"


def _manifest() -> dict:
    text = DOC.read_text()
    start = text.index("```yaml\napiVersion: ray.io/v1\nkind: RayJob")
    block = text[start + len("```yaml\n"):]
    return yaml.safe_load(block[:block.index("```")])


def test_the_rayjob_runs_recsync_and_every_node_shares_the_token():
    job = _manifest()
    assert job["kind"] == "RayJob" and job["spec"]["entrypoint"].startswith("recsync train")
    spec = job["spec"]["rayClusterSpec"]
    groups = [spec["headGroupSpec"], *spec["workerGroupSpecs"]]
    containers = [c for g in groups for c in g["template"]["spec"]["containers"]]
    assert len(containers) == 3
    for c in containers:
        env = {e["name"]: e for e in c["env"]}
        assert env["RAY_AUTH_MODE"]["value"] == "token", c["name"]
        assert env["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "recsync-ray-token"
