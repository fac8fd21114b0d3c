"""Page views, one module per page (or family of pages); thin: parse, call one service or reader, render."""
