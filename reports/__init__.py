"""The HTML report: a view model built from run files, then rendered with jinja2."""
