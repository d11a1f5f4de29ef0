"""tutti-run's implementation (the `scripts/tutti-run` entry imports it):
cli (options), hosts (discovery, probes, leaving records), journal
(launches.jsonl, checkpoint progress), runner (the restart loop)."""
