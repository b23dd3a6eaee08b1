"""One adapter per span convention: each turns a decoded span into a turn, a marker, or nothing."""
