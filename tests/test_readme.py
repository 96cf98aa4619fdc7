"""The README's placement-policy table lists exactly the registered policies, with their summaries."""

import re
from pathlib import Path

from gpuslice.policies import PLACEMENT

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_policy_table_matches_the_registry():
    text = README.read_text()
    section = text[text.index("## Placement policies") :]
    section = section[: section.index("\n## ", 1)]
    rows = dict(re.findall(r"^\| `([a-z0-9-]+)` \| (.+?) \|$", section, flags=re.MULTILINE))
    assert rows == {name: cls.summary for name, cls in PLACEMENT.items()}
