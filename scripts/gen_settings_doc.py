#!/usr/bin/env python3
"""Regenerates docs/settings.md from the settings table in src/core/config.cc.

The C++ table is the source of truth; tests/core/test_config.cc fails when the
document and the table disagree.  Run: python3 scripts/gen_settings_doc.py
"""
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
src = (ROOT / "src/core/config.cc").read_text()
body = src[src.index("kSettings = {"):src.index("};", src.index("kSettings = {"))]
# Each entry: {"NAME", "type", "default", "help" "help"...},
entries = []
sections = []
for m in re.finditer(r'//\s*----\s*(.+)|\{\s*"(TUTTI_\w+)",\s*"(\w+)",\s*"([^"]*)",\s*((?:"[^"]*"\s*)+)\}', body):
    if m.group(1):
        sections.append((len(entries), m.group(1).strip()))
        continue
    help_text = "".join(re.findall(r'"([^"]*)"', m.group(5)))
    entries.append((m.group(2), m.group(3), m.group(4), help_text))

out = ["# TUTTI_* settings", "",
       "Every environment variable tutti reads, in one place. Values are read on first",
       "use and cached (`tutti::config::reload()` / `tutti.config_reload()` re-reads them).",
       "A malformed value is an error naming the variable, the value and the default.",
       "This page is generated from `src/core/config.cc` by `scripts/gen_settings_doc.py`.", ""]
sec_at = dict(sections)
for i, (name, typ, default, help_text) in enumerate(entries):
    if i in sec_at:
        out += ["", f"## {sec_at[i].capitalize()}", "",
                "| setting | type | default | meaning |", "|---|---|---|---|"]
    out.append(f"| `{name}` | {typ} | `{default}` | {help_text} |")
(ROOT / "docs/settings.md").write_text("\n".join(out) + "\n")
print(f"wrote docs/settings.md with {len(entries)} settings")
