"""The course map holds together: every exercise id, grade id and link resolves (issue #42 item 4)."""

import json
import re
from pathlib import Path

from pagedkv.labs.exercises import EXERCISES, label, of_notebook

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
SLUG = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")


def cells(path):
    return json.loads(path.read_text())["cells"]


def notebook_name(path) -> str:
    return path.stem.split("_", 1)[1]


def test_exercise_ids_are_slugs_of_existing_notebooks():
    names = {notebook_name(p) for p in NOTEBOOKS}
    for key, exercise in EXERCISES.items():
        assert SLUG.match(key) and not re.search(r"(^|-)(ex)?\d+(-e\d+)?(-|$)", key), key  # no notebook number
        assert exercise.notebook in names, (key, exercise.notebook)


def test_each_exercise_has_its_cells_in_its_notebook_in_order():
    """Each notebook's check cells call its exercises in the order of EXERCISES (the labels E1, E2... come from
    it), with nbgrader grade ids <slug>-answer and <slug>-check, and its prompts carry the same labels."""
    for path in NOTEBOOKS:
        keys = of_notebook(path.name)
        graded = [c for c in cells(path) if c.get("metadata", {}).get("nbgrader", {}).get("grade")]
        called = [re.search(r'check\.exercise\("([^"]+)"', "".join(c["source"])).group(1) for c in graded]
        assert called == keys, (path.name, called, keys)
        ids = {c["metadata"]["nbgrader"]["grade_id"] for c in cells(path) if "nbgrader" in c.get("metadata", {})}
        for key in keys:
            assert {f"{key}-answer", f"{key}-check"} <= ids, (path.name, key)
        prompts = re.findall(r"\*\*(E\d+)[ .]", "".join("".join(c["source"]) for c in cells(path)
                                                     if c["cell_type"] == "markdown"))
        assert prompts == [label(k) for k in keys], (path.name, prompts)


def test_every_notebook_ends_with_exercises():
    for path in NOTEBOOKS:
        assert len(of_notebook(path.name)) >= 2, path.name


def test_grade_ids_are_unique_over_the_course():
    seen = {}
    for path in NOTEBOOKS:
        for cell in cells(path):
            grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
            if grade_id:
                assert grade_id not in seen, (grade_id, path.name, seen.get(grade_id))
                seen[grade_id] = path.name


def test_titles_carry_the_file_number():
    for path in NOTEBOOKS:
        assert "".join(cells(path)[0]["source"]).startswith(f"# {path.name[:2]} · "), path.name


LINKED = ["README.md", "notebooks/README.md", "ARCHITECTURE.md"]


def test_every_local_link_resolves():
    """Links in README, the instructor guide and the course map (and every course/ link) name files that exist."""
    docs = [ROOT / name for name in LINKED] + sorted(ROOT.glob("*.md"))
    for doc in dict.fromkeys(docs):
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", doc.read_text()):
            if re.match(r"[a-z]+:", target):
                continue  # a web address
            assert (doc.parent / target).exists(), (doc.name, target)


def test_notebook_numbers_named_in_prose_exist():
    """A "notebook NN" anywhere in the docs or the notebooks' text names a notebook of the course (written, or
    planned in pagedkv/labs/concepts.py)."""
    from pagedkv.labs.concepts import COURSE

    numbers = {p.name[:2] for p in NOTEBOOKS} | {f"{n.number:02d}" for n in COURSE}
    texts = {p.name: "".join("".join(c["source"]) for c in cells(p)) for p in NOTEBOOKS}
    texts.update({name: (ROOT / name).read_text() for name in LINKED})
    for name, text in texts.items():
        for number in re.findall(r"\b[Nn]otebooks? (\d\d)\b", text):
            assert number in numbers, (name, number)


# ------------------------------------------------------------------------------------------- concepts
def concept_lists():
    """(file, introduces, uses) for every notebook of the course in order: a present notebook's own metadata,
    a planned one's intended lists."""
    from pagedkv.labs.concepts import COURSE

    present = {p.name: p for p in NOTEBOOKS}
    rows = []
    for notebook in COURSE:
        if notebook.file in present:
            meta = json.loads(present[notebook.file].read_text())["metadata"].get("pagedkv", {})
            rows.append((notebook.file, meta.get("introduces"), meta.get("uses")))
        else:
            assert notebook.planned, f"{notebook.file} is neither in notebooks/ nor planned"
            rows.append((notebook.file, *map(list, notebook.planned)))
    return rows


def test_the_course_lists_every_notebook_in_order():
    from pagedkv.labs.concepts import COURSE

    files = [n.file for n in COURSE]
    assert [n.number for n in COURSE] == list(range(1, len(COURSE) + 1))
    assert {p.name for p in NOTEBOOKS} <= set(files), "a notebook the course map does not know"


def test_every_notebook_says_what_it_introduces_and_uses():
    from pagedkv.labs.concepts import CONCEPTS

    for file, introduces, uses in concept_lists():
        assert isinstance(introduces, list) and isinstance(uses, list), f"{file}: no pagedkv metadata"
        for slug in introduces + uses:
            assert slug in CONCEPTS, f"{file}: {slug!r} is not in pagedkv/labs/concepts.py"
        assert not set(introduces) & set(uses), f"{file} uses what it introduces: {set(introduces) & set(uses)}"


def test_each_concept_is_introduced_once_and_used_only_after():
    introduced = {}
    for file, introduces, uses in concept_lists():
        for slug in uses:
            assert slug in introduced, f"{file} uses {slug!r} before any notebook introduces it"
        for slug in introduces:
            assert slug not in introduced, f"{slug!r} is introduced twice: {introduced[slug]} and {file}"
            introduced[slug] = file


def test_every_concept_has_a_home():
    from pagedkv.labs.concepts import CONCEPTS

    homes = {slug for _, introduces, _ in concept_lists() for slug in introduces}
    assert set(CONCEPTS) == homes, f"concepts no notebook introduces: {set(CONCEPTS) - homes}"


def test_the_committed_map_is_the_generated_one():
    from pagedkv.labs.course_map import make_map

    assert (ROOT / "COURSE_MAP.md").read_text() == make_map(ROOT / "notebooks"), \
        "COURSE_MAP.md is stale: run python -m pagedkv map"


VLLM_SRC = Path.home() / ".cache" / "vllm-src"


def test_the_version_notes_links_exist_in_their_releases():
    """VERSIONS.md links vLLM's source at pinned releases: each file or folder exists in that release's source
    (~/.cache/vllm-src/<release>/, where PLAN.md keeps them; skipped for a release that is not there)."""
    import pytest

    links = re.findall(r"github\.com/vllm-project/vllm/(?:blob|tree)/v([\d.]+)/([^)#\s]+)",
                       (ROOT / "VERSIONS.md").read_text())
    assert len(links) >= 10
    checked = 0
    for release, path in links:
        if (VLLM_SRC / release).is_dir():
            assert (VLLM_SRC / release / path).exists(), f"VERSIONS.md: {path} is not in vLLM {release}"
            checked += 1
    if not checked:
        pytest.skip("no vLLM source at hand (~/.cache/vllm-src)")
