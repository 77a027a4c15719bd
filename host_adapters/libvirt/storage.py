"""A host's storage pool: base images (uploaded to a temporary volume, checked, published),
the seed volumes instances read their NoCloud documents from, and volume look-ups.

Instance disks are overlay volumes on a base image; spawn (driver.py) makes them.
"""

import uuid
import xml.etree.ElementTree as ET
from collections.abc import Iterable

from common.errors import Conflict, HostError, HostUnavailable, InvalidInput, NotFound
from host_adapters.guests import seed as seeds
from host_adapters.guests.guest import GuestSpec, check_positive
from host_adapters.hypervisor import GiB, Progress
from host_adapters.images.image_source import check_qcow2_header, open_image_source
from host_adapters.libvirt import xml as domain_xml
from host_adapters.libvirt.connection import _code, _connection_lost, _libvirt, _msg, _while_pool_busy
from host_adapters.libvirt.volume_io import StreamVolumeIO, VolumeIO
from host_adapters.names import check_id

# A seed is padded to this fixed size, so a running guest reads a rewritten seed
# after a reset without its disk changing size.
SEED_BYTES = 4 * 1024 * 1024


class StoragePart:
    """The storage pool of LibvirtHypervisor (driver.py): `storage_pool` names it; `volume_io`
    writes and reads volume content (libvirt streams; the test driver has none)."""

    def _init_storage(self, storage_pool: str, volume_io: VolumeIO | None) -> None:
        self.storage_pool = storage_pool
        self._io = volume_io or StreamVolumeIO()

    def _pool(self, conn):
        lv = _libvirt()
        try:
            pool = conn.storagePoolLookupByName(self.storage_pool)
        except lv.libvirtError as e:
            if _code(e) == lv.VIR_ERR_NO_STORAGE_POOL:
                raise HostUnavailable(f"libvirt storage pool {self.storage_pool!r} not found at {self.uri}") from e
            raise
        if not pool.isActive():
            raise HostUnavailable(f"libvirt storage pool {self.storage_pool!r} is not active")
        return pool

    @staticmethod
    def _volume(pool, name: str):
        lv = _libvirt()
        try:
            return pool.storageVolLookupByName(name)
        except lv.libvirtError as e:
            if _code(e) == lv.VIR_ERR_NO_STORAGE_VOL:
                return None
            raise

    @staticmethod
    def _delete_volume(vol) -> None:
        lv = _libvirt()
        try:
            _while_pool_busy(vol.delete, 0)  # a create elsewhere in the pool makes libvirt refuse for a while
        except lv.libvirtError as e:
            if _code(e) != lv.VIR_ERR_NO_STORAGE_VOL:
                raise

    def _remove_volumes(self, conn, names: Iterable[str]) -> None:
        """Delete these volumes of the pool, by name, where they exist (on a possibly new connection)."""
        names = list(names)
        if names:
            pool = self._pool(conn)
            for name in names:
                vol = self._volume(pool, name)
                if vol is not None:
                    self._delete_volume(vol)

    def _write_seed(self, conn, pool, instance_id: str, guest: GuestSpec) -> None:
        name = self._names.seed(instance_id)
        data = seeds.build_iso(seeds.render(instance_id, guest))
        if len(data) > SEED_BYTES:
            raise HostError(f"the seed of instance {instance_id} is {len(data)} bytes, more than {SEED_BYTES}")
        vol = self._volume(pool, name)
        if vol is None:
            vol = _while_pool_busy(pool.createXML,
                                   domain_xml.Volume(name=name, capacity_bytes=SEED_BYTES, format="raw").to_xml(), 0)
        self._io.write(conn, vol, data, pad_to=SEED_BYTES)

    def _read_seed(self, conn, vol) -> dict[str, str] | None:
        # A seed is SEED_BYTES: a volume of that name declaring more is not read into memory.
        data = self._io.read(conn, vol, limit=SEED_BYTES)
        try:
            return seeds.read_iso(data)
        except InvalidInput:
            return None

    def create_base_image(
        self,
        image_id: str,
        *,
        size_gb: int,
        source: str | None = None,
        progress: Progress | None = None,
    ) -> str:
        check_id(image_id, "image id")
        check_positive(size_gb=size_gb)
        # Opened once: the check and the upload read this descriptor, never the path again.
        image = open_image_source(source, size_gb) if source is not None else None
        name = self._names.base(image_id)
        temp = self._names.partial_base(image_id, uuid.uuid4().hex[:8])
        made: list[str] = []  # the volumes this call created: a failure removes them by name

        def op(conn):
            lv = _libvirt()
            pool = self._pool(conn)
            if self._volume(pool, name) is not None:
                raise Conflict(f"base image of image {image_id} already exists")
            if image is None or not self._io.keeps_content:
                # Without content streams (the test driver) the checked source stands
                # in as a blank disk of the image's size: made whole by one call.
                made.append(name)
                volume = domain_xml.Volume(name=name, capacity_bytes=size_gb * GiB)
                _while_pool_busy(pool.createXML, volume.to_xml(), 0)
                if image is not None and progress is not None:
                    progress(image.size, image.size)
                return
            # The content goes to a temporary volume first: a base image's name is only ever
            # seen complete and checked, by a concurrent create on this host or after a crash
            # mid-upload (which leaves the temporary volume; reconcile reports it).
            # Upload writes over the file without truncating it: start from an empty file
            # of the exact size; libvirt probes it as qcow2 after.
            made.append(temp)
            vol = _while_pool_busy(pool.createXML,
                                   domain_xml.Volume(name=temp, capacity_bytes=image.size, format="raw").to_xml(), 0)
            self._io.upload_file(conn, vol, image, progress)
            self._check_stored_base(conn, pool, temp, size_gb)
            self._check_upload(conn, vol, image)
            # Published by a copy within the pool, made by the host (libvirt has no volume
            # rename, and the pool may be on another machine): the name appears when the copy
            # begins, but every create of this deployment looks for it only under the
            # image's copy lock (controller/hosts/image_copy.py), held until this returns.
            made.append(name)
            try:
                _while_pool_busy(pool.createXMLFrom, domain_xml.Volume(name=name, capacity_bytes=image.size).to_xml(),
                                 vol, 0)
            except lv.libvirtError as e:
                if _code(e) == getattr(lv, "VIR_ERR_STORAGE_VOL_EXIST", -1) or (
                        not _connection_lost(e) and self._volume(pool, name) is not None
                        and "already" in _msg(e)):
                    made.remove(name)  # another process published it meanwhile: not ours to remove
                    raise Conflict(f"base image of image {image_id} already exists") from e
                raise
            self._check_stored_base(conn, pool, name, size_gb)
            self._delete_volume(self._volume(pool, temp) or vol)
            made.remove(temp)

        try:
            self._call(f"create base image of image {image_id}", op, retry=False)
        except BaseException as err:  # a progress callback may raise anything
            if made:
                self._undo(err, f"volume {', '.join(made)}", lambda conn: self._remove_volumes(conn, list(made)))
            raise
        finally:
            if image is not None:
                image.close()
        return name

    def _check_upload(self, conn, vol, image) -> None:
        """The uploaded volume holds the source's bytes: its size on the host and the SHA-256
        of its content read back over the connection. HostError otherwise (the caller removes
        it): a stream that ended short, or content changed on the way."""
        lv = _libvirt()
        physical = vol.infoFlags(lv.VIR_STORAGE_VOL_GET_PHYSICAL)[2]
        if physical != image.size:
            raise HostError(f"the uploaded base image {vol.name()} is {physical} bytes, its source {image.size}; "
                            "removed")
        if self._io.digest(conn, vol) != image.sha256():
            raise HostError(f"the uploaded base image {vol.name()} differs from its source (SHA-256); removed")

    def _check_stored_base(self, conn, pool, name: str, size_gb: int) -> None:
        """What was stored is what was checked: libvirt sees a qcow2 volume without a backing
        file, and its own header passes the source check (the source file may have been
        written to in place while it was uploaded). InvalidInput otherwise (the caller
        removes the volume)."""
        # Upload ends with an asynchronous refresh; ours makes libvirt probe the file now. The
        # pool holds no guest-written byte (the consoles are in a folder no pool holds, console_log.py),
        # so the probe reads only images the controller made; a volume being built elsewhere
        # in the pool makes libvirt refuse the refresh for a while.
        _while_pool_busy(pool.refresh, 0)
        vol = pool.storageVolLookupByName(name)
        xml = vol.XMLDesc(0)
        fmt = ET.fromstring(xml).find("target/format")
        if fmt is None or fmt.get("type") != "qcow2":
            found = fmt.get("type") if fmt is not None else "unknown"
            raise InvalidInput(f"the uploaded base image {name} is stored as {found}, not qcow2; removed")
        if domain_xml.backing_path_of(xml) is not None:
            raise InvalidInput(f"the uploaded base image {name} refers to a backing file; removed")
        check_qcow2_header(self._io.read_head(conn, vol, 80), size_gb, f"the uploaded base image {name}")

    def delete_base_image(self, image_id: str) -> None:
        check_id(image_id, "image id")
        name = self._names.base(image_id)

        def op(conn):
            pool = self._pool(conn)
            vol = self._volume(pool, name)
            if vol is None:
                return
            path = vol.path()
            for other in pool.listAllVolumes(0):
                if other.name() != name and domain_xml.backing_path_of(other.XMLDesc(0)) == path:
                    raise Conflict(f"base image of image {image_id} is in use by volume {other.name()}")
            self._delete_volume(vol)

        self._call(f"delete base image of image {image_id}", op)

    def list_base_images(self) -> list[str]:
        def op(conn):
            names = (v.name() for v in self._pool(conn).listAllVolumes(0))
            return sorted({i for i in map(self._names.image_of_base, names) if i})

        return self._call("list base images", op)

    def list_partial_base_images(self) -> list[str]:
        def op(conn):
            names = (v.name() for v in self._pool(conn).listAllVolumes(0))
            return sorted(n for n in names if self._names.image_of_partial(n))

        return self._call("list temporary base image volumes", op)

    def delete_partial_base_image(self, volume: str) -> None:
        if not isinstance(volume, str) or not self._names.image_of_partial(volume):
            raise InvalidInput(f"{volume!r} is not a temporary base image volume")
        self._call(f"delete temporary volume {volume}", lambda conn: self._remove_volumes(conn, [volume]))

    def read_base_image(self, image_id: str, dest: int, *, max_bytes: int,
                        progress: Progress | None = None) -> bool:
        check_id(image_id, "image id")
        name = self._names.base(image_id)
        if not self._io.keeps_content:
            return False

        def op(conn):
            vol = self._volume(self._pool(conn), name)
            if vol is None:
                raise NotFound(f"base image of image {image_id} is missing from storage pool {self.storage_pool}")
            self._io.download_file(conn, vol, dest, progress, limit=max_bytes)
            return True

        return self._call(f"read base image of image {image_id}", op, retry=False)
