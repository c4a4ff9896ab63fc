"""`python -m loradoctor.logs.rules sync-schema`: rewrite the schema's repro enum from the repro library (cause ids come from the catalogue at load time)."""

import sys
from pathlib import Path

from loradoctor.logs.rules.schema import sync_schema_enums

if sys.argv[1:] == ["sync-schema"]:
    print("added:", ", ".join(sync_schema_enums(Path(__file__).resolve().parent.parent.parent.parent)) or "nothing")
else:
    print("usage: python -m loradoctor.logs.rules sync-schema", file=sys.stderr)
    sys.exit(2)
