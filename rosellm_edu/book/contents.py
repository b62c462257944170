"""The book's map, generated from book.toml, so that chapter 00's introduction lists the chapters as they are."""

from pathlib import Path

from rosellm_edu.book.export import ROOT, load_book


def chapter_map(root: Path = ROOT) -> str:
    """A Markdown table of the book's chapters and appendices, in book.toml's order: number and title."""
    _, chapters = load_book(root)
    rows = [f"| {chapter.notebook.split('_')[0]} | {'Appendix: ' * chapter.appendix}{chapter.title} |"
            for chapter in chapters]
    return "\n".join(["| Chapter | Title |", "| --- | --- |", *rows])
