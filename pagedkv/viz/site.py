"""``make site``: the reading copies (``course/``) as a static site, the course's key runs embedded as players.

Each ``course/NN_name.ipynb`` becomes ``site/NN_name.html`` through nbconvert's HTML exporter (its ``lab``
template, with every script it would fetch from a CDN left out: require.js, MathJax, mermaid, the widget
manager), so nothing is requested from the network at build or view time; the few display equations stay as
their TeX source. The runs of ``runs.RUNS`` whose ``notebook`` is that notebook's name (without its number) are
recorded and embedded after its title cell, each a ``player.js`` player with its trace inline, so a page also
plays when opened from disk. A figure's ``alt`` (the cell metadata the course gives each one) becomes its image's
alternative text. ``index.html`` lists the notebooks in course order. The answers stay out as the
reading copies keep them out: the site is made from ``course/``, never from ``notebooks/``.
"""

from __future__ import annotations

import html
import re
from pathlib import Path

import nbformat

from .runs import RUNS
from .trace import player_markup, player_script

TEMPLATE = """{%- extends 'lab/index.html.j2' -%}
{%- block html_head_js -%}{%- endblock html_head_js -%}
{%- block html_head_js_mathjax -%}{%- endblock html_head_js_mathjax -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
{%- block jupyter_widgets -%}{%- endblock jupyter_widgets -%}
{%- block extra_css -%}<link rel="icon" href="data:,"><style>
.pkv-nav { font-family: system-ui, sans-serif; font-size: 14px; padding: 8px 16px; background: #f3f3f3;
  border-bottom: 1px solid #ddd; display: flex; gap: 18px; flex-wrap: wrap; }
.pkv-nav a { color: #0b5394; text-decoration: none; }
.pkv-runs { padding: 0 16px 0 calc(var(--jp-cell-prompt-width, 64px) + 22px);
  font-family: var(--jp-content-font-family); color: var(--jp-content-font-color1);
  font-size: var(--jp-content-font-size1); }
</style>{%- endblock extra_css -%}
{%- block body_header -%}{{ super() }}{{ resources.pagedkv_nav }}{%- endblock body_header -%}
{%- block footer_js -%}{{ resources.pagedkv_script }}{%- endblock footer_js -%}
{%- block data_png scoped -%}
<div class="jp-RenderedImage jp-OutputArea-output {{ extra_class }}">
<img src="data:image/png;base64,{{ output.data['image/png'] | escape_html }}"
 alt="{{ cell.metadata.get('alt', 'A figure: its text map follows.') | escape_html }}"></div>
{%- endblock data_png -%}
{%- block any_cell -%}
{%- if cell.metadata.get("pagedkv_players") -%}{{ cell.source }}{%- else -%}{{ super() }}{%- endif -%}
{%- endblock any_cell -%}
"""

INDEX = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>pagedkv: how vLLM manages the KV cache in pages</title><link rel="icon" href="data:,">
<style>body {{ font-family: system-ui, sans-serif; max-width: 60em; margin: 2em auto; padding: 0 1em; color: #222; }}
li {{ margin: 0.4em 0; }} .runs {{ color: #555; font-size: 0.9em; }} a {{ color: #0b5394; }}</style>
</head><body>
<h1>pagedkv: how vLLM manages the KV cache in pages</h1>
<p>The course's notebooks as reading copies: every explanation, figure and stored output, with the exercise answers
and the prediction checks removed. To work them, run <code>make lab</code> in a clone. The recorded runs on the
pages play in the browser with no Python behind them: step forward and back through each one, its block map and
its text map side by side.</p>
<ol>
{items}
</ol>
</body></html>
"""


def notebook_name(path: Path) -> str:
    """``03_free_list_allocation.ipynb`` -> ``free_list_allocation`` (what ``runs.Run.notebook`` names)."""
    return re.sub(r"^\d+_", "", path.stem)


def notebook_title(nb) -> str:
    """The notebook's own first heading (not the reading copy's header cell, ``id: reading-header``)."""
    for cell in nb.cells:
        if cell.cell_type == "markdown" and cell.get("id") != "reading-header":
            for line in cell.source.splitlines():
                if line.startswith("# "):
                    return line[2:].strip()
    return ""


def runs_cell(runs: list, traces: dict) -> nbformat.NotebookNode:
    """A raw HTML cell holding a player per run (its trace inline)."""
    parts = ['<section class="pkv-runs"><h2>Step through it</h2>',
             "<p>A recorded run of this notebook's machinery, played in the browser (no kernel): step with the "
             "buttons, the slider or the arrow keys; the text block map beside the picture is the one Python "
             "printed at that step.</p>"]
    for run in runs:
        parts.append(player_markup(traces[run.name], f"pkv-run-{run.name}"))
    parts.append("</section>")
    return nbformat.v4.new_raw_cell("\n".join(parts), metadata={"pagedkv_players": True})


IMAGE = re.compile(r"(!\[[^\]]*\]\()(?!https?:|data:)([^)\s]+)(\))")


def rebase_images(nb, folder: Path, base: Path) -> None:
    """Markdown images (``../figures/x.png``) as paths from ``base``, where nbconvert's ``embed_images`` looks (it
    reads nothing above the folder it is given), so they are inlined as data URLs."""
    def rebase(match):
        target = (folder / match.group(2)).resolve()
        try:
            return f"{match.group(1)}{target.relative_to(base.resolve()).as_posix()}{match.group(3)}"
        except ValueError:
            return match.group(0)

    for cell in nb.cells:
        if cell.cell_type == "markdown":
            cell.source = IMAGE.sub(rebase, cell.source)


def build_site(course="course/", out="site/", runs=None) -> list[Path]:
    """Render every ``course/NN_*.ipynb`` to ``out``, with its runs as players, and an index; the pages written."""
    from jinja2 import DictLoader
    from nbconvert import HTMLExporter

    course, out = Path(course), Path(out)
    runs = RUNS if runs is None else runs
    out.mkdir(parents=True, exist_ok=True)
    exporter = HTMLExporter(template_name="lab", extra_loaders=[DictLoader({"pagedkv_site.html.j2": TEMPLATE})],
                            template_file="pagedkv_site.html.j2", embed_images=True)
    paths = sorted(course.glob("[0-9][0-9]_*.ipynb"))
    notebooks = [(path, nbformat.read(path, as_version=4)) for path in paths]
    titles = [notebook_title(nb) or notebook_name(path).replace("_", " ") for path, nb in notebooks]
    nav = ('<nav class="pkv-nav"><a href="index.html">pagedkv course</a>'
           + "".join(f'<a href="{p.stem}.html">{p.stem[:2]}</a>' for p, _ in notebooks) + "</nav>")
    script = player_script()
    written, items = [], []
    for (path, nb), title in zip(notebooks, titles):
        mine = [r for r in runs if r.notebook == notebook_name(path)]
        traces = {r.name: r.record() for r in mine}
        rebase_images(nb, path.parent, course.parent)
        if mine:
            nb.cells.insert(min(2, len(nb.cells)), runs_cell(mine, traces))  # after the reading header and title
        body, _ = exporter.from_notebook_node(nb, resources={
            "metadata": {"name": title, "path": str(course.parent)},
            "pagedkv_nav": nav, "pagedkv_script": script if mine else ""})
        target = out / f"{path.stem}.html"
        target.write_text(body, encoding="utf-8")
        written.append(target)
        extra = f' <span class="runs">(plays: {", ".join(html.escape(r.title) for r in mine)})</span>' if mine else ""
        items.append(f'<li><a href="{path.stem}.html">{html.escape(title)}</a>{extra}</li>')
    index = out / "index.html"
    index.write_text(INDEX.format(items="\n".join(items)), encoding="utf-8")
    return [index, *written]
