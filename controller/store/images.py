"""Server-images and server-flavors (tables images, flavors) and their grants
(image_access, flavor_access)."""

import sqlite3

from controller.errors import Conflict


class ImageRows:
    """Store's methods for these tables (composed in controller/store/__init__.py): they read
    and write through Database's connection (_one, _all, conn) and its write()."""

    @staticmethod
    def _refuse_active_namesake(conn: sqlite3.Connection, name: str, image_id: str) -> None:
        """Names of active images are unique: a name then picks one bootable image
        (common.client.image_names). Checked in the write's transaction, so two adds cannot
        both pass."""
        other = conn.execute("SELECT id FROM images WHERE active = 1 AND name = ? AND id != ?",
                             (name, image_id)).fetchone()
        if other is not None:
            raise Conflict(f"an active image is already named {name!r} ({other[0]}): names of active images "
                           "are unique; deactivate that one or choose another name")

    def insert_image(self, image: dict) -> None:
        with self.write() as conn:
            if image.get("active", 1):
                self._refuse_active_namesake(conn, image["name"], image["id"])
            self.db["images"].insert(image)

    def active_image_named(self, name: str) -> dict | None:
        return self._one("SELECT * FROM images WHERE active = 1 AND name = ?", (name,))

    def get_image(self, image_id: str) -> dict | None:
        return self._one("SELECT * FROM images WHERE id = ?", (image_id,))

    def _usable(self, table: str, access: str, key: str, order: str, usable_by: str | None,
                item_id: object) -> list[dict]:
        """Rows of `table` (images or flavors): all of them (usable_by None) or the public ones
        plus those `access` grants to usable_by; only item_id's when given."""
        where, params = ["1"], []
        if usable_by is not None:
            where.append(f"(public = 1 OR id IN (SELECT {key} FROM {access} WHERE user_id = ?))")
            params.append(usable_by)
        if item_id is not None:
            where.append("id = ?")
            params.append(item_id)
        return self._all(f"SELECT * FROM {table} WHERE {' AND '.join(where)} ORDER BY {order}", params)

    def list_images(self, *, usable_by: str | None = None, image_id: str | None = None) -> list[dict]:
        """All images (usable_by None) or the public ones plus those granted to usable_by."""
        return self._usable("images", "image_access", "image_id", "creation_date, id", usable_by, image_id)

    def update_image(self, image_id: str, changes: dict) -> None:
        with self.write() as conn:
            now = conn.execute("SELECT name, active FROM images WHERE id = ?", (image_id,)).fetchone()
            if now is not None and changes.get("active", now["active"]):
                self._refuse_active_namesake(conn, changes.get("name", now["name"]), image_id)
            self.db["images"].update(image_id, changes)

    def delete_image(self, image_id: str) -> None:
        """Remove an image's row (its grants go with it); refused while an instance row names it."""
        try:
            with self.write() as conn:
                conn.execute("DELETE FROM images WHERE id = ?", (image_id,))
        except sqlite3.IntegrityError:
            raise Conflict(f"server-image {image_id} is used by server-instances: delete them first "
                           "(an evacuation rebuilds from it)") from None

    def update_flavor(self, flavor_id: int, changes: dict) -> None:
        try:
            with self.write():
                self.db["flavors"].update(flavor_id, changes)
        except sqlite3.IntegrityError:
            raise Conflict(f"a flavor named {changes.get('name')!r} exists") from None

    def delete_flavor(self, flavor_id: int) -> None:
        """Remove a flavor's row (its grants go with it); refused while an instance row names it."""
        try:
            with self.write() as conn:
                conn.execute("DELETE FROM flavors WHERE id = ?", (flavor_id,))
        except sqlite3.IntegrityError:
            raise Conflict(f"server-flavor {flavor_id} is used by server-instances: delete them first") from None

    def grant_image(self, image_id: str, user_id: str) -> None:
        with self.write() as conn:
            conn.execute("INSERT OR IGNORE INTO image_access (image_id, user_id) VALUES (?, ?)", (image_id, user_id))

    def insert_flavor(self, flavor: dict) -> dict:
        flavor = {"public": 1, "lease_default_seconds": None, "lease_max_seconds": None, **flavor}
        try:
            with self.write() as conn:
                cur = conn.execute(
                    """INSERT INTO flavors (name, memory, disk, vcpu, public, lease_default_seconds, lease_max_seconds)
                       VALUES (:name, :memory, :disk, :vcpu, :public, :lease_default_seconds, :lease_max_seconds)""",
                    flavor,
                )
        except sqlite3.IntegrityError:
            raise Conflict(f"a flavor named {flavor['name']!r} exists") from None
        return dict(flavor, id=cur.lastrowid)

    def get_flavor(self, flavor_id: int) -> dict | None:
        return self._one("SELECT * FROM flavors WHERE id = ?", (flavor_id,))

    def list_flavors(self, *, usable_by: str | None = None, flavor_id: int | None = None) -> list[dict]:
        """All flavors (usable_by None) or the public ones plus those granted to usable_by."""
        return self._usable("flavors", "flavor_access", "flavor_id", "id", usable_by, flavor_id)

    def grant_flavor(self, flavor_id: int, user_id: str) -> None:
        with self.write() as conn:
            conn.execute("INSERT OR IGNORE INTO flavor_access (flavor_id, user_id) VALUES (?, ?)",
                         (flavor_id, user_id))
