"""MkDocs hooks of the docs site (mkdocs.yml): what the site builds from the repository rather than docs/.

- ``index.md`` is the README, its links made the site's: ``docs/X.md`` -> ``X.md``, a results
  page ``benchmarks/results/NAME.md`` -> its section of ``benchmarks.md``;
- ``<!-- cli-reference -->`` in ``cli.md`` becomes every command's ``--help``
  (:func:`c2c.cli.reference.markdown`), generated from the argparse definitions;
- ``<!-- results-files -->`` in ``benchmarks.md`` becomes one section per results file of
  ``benchmarks/results/``: its table and, where there is one, its plot (copied into the site).
"""

from __future__ import annotations

import re
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def on_files(files, config):
    for png in sorted(RESULTS.glob("*.png")):
        files.append(File(f"results/{png.name}", src_dir=str(RESULTS.parent), dest_dir=config["site_dir"],
                          use_directory_urls=config["use_directory_urls"]))
    return files


def on_page_markdown(markdown, page, config, files):
    if markdown.startswith("<!-- readme"):
        return readme()
    if "<!-- cli-reference -->" in markdown:
        from c2c.cli import reference

        markdown = markdown.replace("<!-- cli-reference -->", reference.markdown())
    if "<!-- results-files -->" in markdown:
        markdown = markdown.replace("<!-- results-files -->", results_sections())
    return markdown


def readme() -> str:
    text = (ROOT / "README.md").read_text()
    text = re.sub(r"\]\(docs/([^)]+)\)", r"](\1)", text)
    return re.sub(r"\]\(benchmarks/results/([A-Za-z0-9_]+)\.md\)", r"](benchmarks.md#\1)", text)


def results_sections() -> str:
    out = []
    for md in sorted(RESULTS.glob("*.md")):
        name = md.stem
        body = md.read_text()
        body = re.sub(r"^(#+)", lambda m: "#" * min(6, len(m.group(1)) + 3), body, flags=re.M)  # under ###
        body = re.sub(r"\]\(([^)#:]+)\.md\)", r"](#\1)", body)        # another results page: its section
        body = re.sub(r"!\[([^\]]*)\]\(([^)/:]+\.png)\)", r"![\1](results/\2)", body)
        png = RESULTS / f"{name}.png"
        plot = f"\n![{name}](results/{name}.png)\n" if png.exists() and f"results/{name}.png" not in body else ""
        out.append(f"### {name}\n\n`benchmarks/results/{name}.md`\n{plot}\n{body.strip()}\n")
    return "\n".join(out)
