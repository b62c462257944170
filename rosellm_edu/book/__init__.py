"""The book's tooling: the exporter (export, fold), chapter snapshots for the notebooks (chapter), the HTML book.

`add_to_class` lives here, importing nothing, because the notebooks' exported cells import it.
"""


def add_to_class(cls):
    """Make the decorated function a method of cls, so that a notebook can show a class one method per cell.

    Only a running notebook sets the attribute: the exporter writes such a method into the class body instead.
    """
    def add(function):
        plain = getattr(function, "__func__", None) or getattr(function, "fget", None) or function  # unwrap
        setattr(cls, plain.__name__, function)
        return function

    return add
