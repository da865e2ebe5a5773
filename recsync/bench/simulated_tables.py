"""The report's tables of scenario `simulated`'s validation (simulated.py ``validation``): each
cell, and the model of time fitted on one worker."""

from __future__ import annotations


def validation_tables(compared: dict, calibration: dict) -> dict:
    """The report's tables of the validation: each cell, and the calibration on one worker."""
    return {
        "Validation: SIMULATED against the EMULATED runtime": [
            [cell, c["speed_error"],
             f"samples/s real {c['real_samples_per_s']:,.0f}, simulated "
             f"{c['sim_samples_per_s']:,.0f}; staleness mean real "
             f"{c['real_staleness_mean']:.2f}, simulated {c['sim_staleness_mean']:.2f}; "
             f"AUC real {c['real_auc']['mean']:.4f} (sd "
             f"{c['real_auc']['sd'] or 0:.4f}), simulated {c['sim_auc']['mean']:.4f}"]
            for cell, c in compared.items()],
        "Calibration on one worker (seconds per step)": [
            [m, c["overhead_s"], f"real EMULATED step {c['real_step_s']:.4f} s, simulated "
             f"without overhead {c['sim_step_s_without_overhead']:.4f} s, compute "
             f"{c['compute_s']:.4f} s (the real runs', median); jitter {c['jitter']:.3f} (the "
             f"real runs' of one worker, every mode), {c.get('jitter_common') or 0:.2f} of its "
             f"variance common (the real async and gba runs of 2); shards' CPU per call "
             f"{(c['shard_cpu_per_call_modelled_s'] or 0) * 1e3:.2f} ms modelled, "
             f"{(c['shard_cpu_per_call_real_s'] or 0) * 1e3:.2f} ms real at one worker, of "
             f"it {(c.get('shard_cpu_per_call_fitted_s') or 0) * 1e3:.2f} ms per call and the "
             f"rest by the second ({c.get('shard_cpu_per_s_fitted') or 0:.3f} of a core, the "
             f"real runs at every size): x {c['shard_scale']:.2f}, and each call charged "
             f"{c.get('shard_background') or 0:.3f} s per second since the shard's last; "
             f"a pull's round trip {(c.get('pull_s_real') or 0) * 1e3:.1f} ms real, "
             f"{(c.get('pull_s_simulated') or 0) * 1e3:.1f} ms simulated: latency "
             f"{(c.get('latency_s') or 0) * 1e3:.2f} ms each way"]
            for m, c in calibration.items()],
    }
