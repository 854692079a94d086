"""The documentation site builds in strict mode: a broken link or anchor, or a page of docs/ left out of the nav,
fails `make test` (and so CI), as it fails `make docs`. A small site with each fault shows the check catches it."""

import logging
from pathlib import Path

import pytest
import yaml
from mkdocs.commands.build import build
from mkdocs.config import load_config
from mkdocs.exceptions import Abort

REPO = Path(__file__).resolve().parents[1]


def strict_build(config_file: Path, site: Path) -> None:
    """`mkdocs build --strict` in this process (raises mkdocs' Abort on the first warning's count)."""
    build(load_config(config_file=str(config_file), strict=True, site_dir=str(site)))


def test_the_site_builds_in_strict_mode(tmp_path):
    strict_build(REPO / "mkdocs.yml", tmp_path / "site")
    assert (tmp_path / "site" / "gpu" / "index.html").is_file()


def test_every_page_the_readme_links_is_in_the_site():
    """The README's links into docs/ name pages that exist (the README itself is not part of the site)."""
    readme = (REPO / "README.md").read_text()
    pages = {part.split(")")[0].split("#")[0] for part in readme.split("](docs/")[1:]}
    assert pages, "the README links no page of docs/"
    assert sorted(p for p in pages if not (REPO / "docs" / p).is_file()) == []


@pytest.mark.parametrize(
    "page, text, named",
    [
        ("index.md", "[gone](nowhere.md)\n", "nowhere.md"),  # a link to a missing page
        ("index.md", "[gone](index.md#nowhere)\n", "#nowhere"),  # a missing anchor
        ("orphan.md", "# Orphan\n", "orphan.md"),  # a page left out of the nav
    ],
)
def test_strict_mode_fails_on_each_fault(tmp_path, caplog, page, text, named):
    """The project's validation settings on a one-page site: clean it builds; with the fault it fails, naming it."""
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# Home\n\n## Part\n\n[ok](index.md#part)\n")
    config.update(docs_dir=str(docs), nav=[{"Home": "index.md"}])
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(config))
    strict_build(tmp_path / "mkdocs.yml", tmp_path / "clean")
    with open(docs / page, "a") as f:
        f.write(text)
    with caplog.at_level(logging.WARNING, logger="mkdocs"), pytest.raises(Abort):
        strict_build(tmp_path / "mkdocs.yml", tmp_path / "faulty")
    assert named in caplog.text
