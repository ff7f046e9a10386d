"""The next-edit example every next-edit test uses: a parameter renamed, then its use below made to follow."""

AREA = "def area(width, height):\n    return width * height\n\n\nprint(area(2, 3))\n"
RENAMED = AREA.replace("area(width,", "area(size,")
"""After the user's edit: the parameter renamed, its use not yet."""
FOLLOWED = RENAMED.replace("return width", "return size")
"""After the next edit: the use follows the rename."""
