"""`python -m loradoctor.logs.rules sync-schema`: rewrite the schema's enums from the docs."""

import sys
from pathlib import Path

from loradoctor.logs.rules.schema import sync_schema_enums

if sys.argv[1:] == ["sync-schema"]:
    print("added:", ", ".join(sync_schema_enums(Path(__file__).resolve().parent.parent.parent.parent)) or "nothing")
else:
    print("usage: python -m loradoctor.logs.rules sync-schema", file=sys.stderr)
    sys.exit(2)
