"""polydl."""
