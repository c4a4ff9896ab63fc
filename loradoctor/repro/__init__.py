"""Repros: small programs that confirm a diagnosis on the user's own machine.

Each repro id names one self-contained script under `loradoctor/repro/scripts/`; the runner
(`loradoctor.repro.runner.run_repro`) starts it in a child process of the user's interpreter with
a timeout and reads back one JSON result line (schema `loradoctor.repro/1`, see docs/repro.md).
Nothing here imports torch: only the child processes do.
"""

from loradoctor.repro.catalog import REPRO_IDS, REPROS, ReproSpec, get_spec

__all__ = ["REPRO_IDS", "REPROS", "ReproSpec", "get_spec"]
