"""Real scientific Python packages read files inside images through the
package's file objects and the fsspec `sheaf://` protocol, and get the
values they wrote."""

from __future__ import annotations

import gzip

import fsspec
import h5netcdf  # noqa: F401 - the engine xarray uses below
import nibabel as nib
import numpy as np
import pandas as pd
import pytest
import xarray as xr
import zarr

import sheaf
from conftest import build


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("formats")
    src = d / "src"
    src.mkdir()
    r = np.random.default_rng(40)
    arr = r.standard_normal((64, 48, 5)).astype("float32")
    want = {"arr": arr}
    # zarr, format 2 and format 3.
    for fmt in (2, 3):
        g = zarr.open_group(str(src / f"zarr{fmt}"), mode="w", zarr_format=fmt)
        a = g.create_array("a", shape=arr.shape, chunks=(16, 16, 5), dtype="float32")
        a[:] = arr
        g.attrs["title"] = f"format {fmt}"
    # netCDF-4 (HDF5) through xarray and h5netcdf.
    ds = xr.Dataset(
        {"t": (("time", "x"), r.standard_normal((30, 20)))},
        coords={"time": np.arange(30), "x": np.linspace(0, 1, 20)},
        attrs={"source": "sheaf test"},
    )
    ds.to_netcdf(src / "climate.nc", engine="h5netcdf")
    want["ds"] = ds
    # Tables.
    df = pd.DataFrame(
        {
            "subject": [f"sub-{i:02d}" for i in range(200)],
            "age": r.integers(18, 90, 200),
            "score": r.standard_normal(200),
        }
    )
    (src / "tables").mkdir()
    df.to_csv(src / "tables/participants.csv", index=False)
    df.to_parquet(src / "tables/participants.parquet", engine="pyarrow")
    want["df"] = df
    # NIfTI, gzipped.
    vol = r.integers(0, 1000, (20, 24, 16)).astype("int16")
    affine = np.diag([2.0, 2.0, 2.0, 1.0])
    (src / "sub-01/anat").mkdir(parents=True)
    nib.Nifti1Image(vol, affine).to_filename(str(src / "sub-01/anat/T1w.nii.gz"))
    want["vol"], want["affine"] = vol, affine
    img = build(src, d / "formats.sheaf")
    return img, want


def test_fsspec_finds_the_sheaf_protocol_through_its_entry_point(data):
    img, _ = data
    assert "sheaf" in fsspec.available_protocols() or fsspec.get_filesystem_class("sheaf")
    cls = fsspec.get_filesystem_class("sheaf")
    assert cls.__module__ == "sheaf.fsspec"
    fs = fsspec.filesystem("sheaf", fo=str(img))
    assert sorted(fs.ls("", detail=False)) == ["climate.nc", "sub-01", "tables", "zarr2", "zarr3"]
    assert fs.glob("sub-*/anat/*.nii.gz") == ["sub-01/anat/T1w.nii.gz"]
    assert fs.info("tables")["type"] == "directory"
    assert fs.info("tables/participants.csv")["type"] == "file"
    assert fs.cat_file("tables/participants.csv", 0, 7) == b"subject"
    assert sorted(fs.find("tables")) == ["tables/participants.csv", "tables/participants.parquet"]


def test_zarr_v2_and_v3_stores_inside_an_image(data):
    img, want = data
    fs = fsspec.filesystem("sheaf", fo=str(img))
    for fmt in (2, 3):
        g = zarr.open_group(fs.get_mapper(f"zarr{fmt}"), mode="r")
        assert g.attrs["title"] == f"format {fmt}"
        np.testing.assert_array_equal(g["a"][:], want["arr"])
        np.testing.assert_array_equal(g["a"][3:40, 5:7, 1], want["arr"][3:40, 5:7, 1])


def test_xarray_opens_netcdf_through_h5netcdf(data):
    img, want = data
    im = sheaf.open(img)
    with xr.open_dataset(im.open("climate.nc"), engine="h5netcdf") as ds:
        xr.testing.assert_equal(ds.load(), want["ds"])
        assert ds.attrs["source"] == "sheaf test"
    fs = fsspec.filesystem("sheaf", fo=str(img))
    with xr.open_dataset(fs.open("climate.nc"), engine="h5netcdf") as ds:
        np.testing.assert_array_equal(ds["t"].values, want["ds"]["t"].values)


def test_pandas_reads_csv_and_parquet_from_sheaf_urls(data):
    img, want = data
    so = {"fo": str(img)}
    pd.testing.assert_frame_equal(pd.read_csv("sheaf://tables/participants.csv", storage_options=so), want["df"])
    pd.testing.assert_frame_equal(pd.read_parquet("sheaf://tables/participants.parquet", storage_options=so), want["df"])
    # Chained: the image named by the outer URL.
    pd.testing.assert_frame_equal(pd.read_csv(f"sheaf://tables/participants.csv::file://{img}"), want["df"])
    # Through the package's own file object.
    with sheaf.open(img).open("tables/participants.parquet") as f:
        pd.testing.assert_frame_equal(pd.read_parquet(f), want["df"])


def test_nibabel_reads_a_gzipped_nifti(data):
    img, want = data
    with sheaf.open(img).open("sub-01/anat/T1w.nii.gz") as f:
        fh = nib.FileHolder(fileobj=gzip.GzipFile(fileobj=f))
        n = nib.Nifti1Image.from_file_map({"header": fh, "image": fh})
        np.testing.assert_array_equal(np.asarray(n.dataobj), want["vol"])
        np.testing.assert_array_equal(n.affine, want["affine"])
    with fsspec.open(f"sheaf://sub-01/anat/T1w.nii.gz::file://{img}", compression="gzip") as f:
        n = nib.Nifti1Image.from_bytes(f.read())
        np.testing.assert_array_equal(np.asarray(n.dataobj), want["vol"])


def test_chaining_over_a_protocol_sheaf_has_no_reader_for(data):
    """memory:// is read by fsspec, range by range; sheaf verifies."""
    img, want = data
    mem = fsspec.filesystem("memory")
    mem.pipe("/images/formats.sheaf", img.read_bytes())
    df = pd.read_csv("sheaf://tables/participants.csv::memory://images/formats.sheaf")
    pd.testing.assert_frame_equal(df, want["df"])
    # A damaged copy: an IntegrityError, not wrong values.
    b = bytearray(img.read_bytes())
    im = sheaf.open(img)
    _, _, _, at, n = im.blocks("tables/participants.csv")[0]
    b[at + n // 2] ^= 0x40
    mem.pipe("/images/bad.sheaf", bytes(b))
    with pytest.raises(sheaf.IntegrityError):
        pd.read_csv("sheaf://tables/participants.csv::memory://images/bad.sheaf")
    # A file object as fo.
    with open(img, "rb") as f:
        fs = fsspec.filesystem("sheaf", fo=f, skip_instance_cache=True)
        assert fs.cat_file("tables/participants.csv")[:7] == b"subject"
