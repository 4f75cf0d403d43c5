"""Result stores: the SQLite files of growth runs and of training runs, and their loaders."""
