"""Input discovery: image folders -> (path, label) items."""
