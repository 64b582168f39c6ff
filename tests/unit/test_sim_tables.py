"""The simulator's tables in the docs are rendered from the runs' JSON (bench/sim_tables.py): a
table edited by hand, or a JSON re-run without rendering again, fails here."""

from pathlib import Path

from bench.sim_tables import BLOCK, REPO, rendered

DOC = REPO / "docs" / "simulator.md"


def test_every_table_in_the_simulator_doc_is_its_json_rendered():
    text = DOC.read_text()
    blocks = list(BLOCK.finditer(text))
    assert len(blocks) >= 5, "the docs keep their generated tables"
    assert rendered(text) == text, "run `python -m bench.sim_tables --write docs/simulator.md`"


def test_the_check_catches_a_hand_edited_table():
    text = DOC.read_text()
    block = next(BLOCK.finditer(text))
    edited = text.replace(block.group("body"), block.group("body").replace("|", "| ", 1), 1)
    assert rendered(edited) != edited
    assert Path(REPO / block.group("path")).exists()
