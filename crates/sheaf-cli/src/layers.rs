//! `sheaf commit` (an overlay's upper directory becomes a layer) and
//! `sheaf merge` (a stack of layers becomes one flat image): arguments,
//! opening the layers and the report; the merged walk the builder packs is
//! [`sheaf_build::stack_input`].

use crate::build::{write_image, ImageArgs};
use anyhow::Result;
use sheaf_build::stack_input::{self, StackSource};
use sheaf_build::Input;
use sheaf_read::Stack;
use std::path::PathBuf;
use std::sync::Arc;

/// Arguments of `sheaf commit`.
#[derive(clap::Args, Debug)]
#[command(after_help = "\
Examples:
  sheaf mount base.sheaf /mnt/work --upper changes/   # edit, then sheaf umount /mnt/work
  sheaf commit changes/ -o project.sheaf
  sheaf ls -R base.sheaf,project.sheaf                # the layer on its base

DIR is read as an overlay writes it: new and changed entries as they are,
a deleted lower entry NAME as an empty file .wh.NAME, a directory whose
lower contents are hidden holding an empty file .wh..wh..opq; these are
kept as OCI whiteouts. The overlay's temporary files (.wh..sheaf-*) are left
out. Refused while a writable mount uses DIR.")]
pub struct CommitArgs {
    /// The upper directory of a writable mount (`sheaf mount ... --upper DIR`).
    #[arg(value_hint = clap::ValueHint::DirPath)]
    dir: PathBuf,
    /// The layer image to write.
    #[arg(short, long, value_name = "LAYER")]
    output: PathBuf,
    #[command(flatten)]
    image: ImageArgs,
}

/// Run `sheaf commit`.
pub fn commit(a: CommitArgs, io: &mut crate::Io<'_>) -> Result<i32> {
    let opts = a.image.options()?;
    // Held until the layer is written: a writable mount cannot start meanwhile.
    let lock = sheaf_format::layers::lock(&a.dir, false)?;
    let r = write_image(
        &Input::Upper(a.dir.clone()),
        &a.output,
        &opts,
        &a.image,
        serde_json::json!({ "upper": a.dir.display().to_string() }),
        io,
    );
    drop(lock);
    r
}

/// Arguments of `sheaf merge`.
#[derive(clap::Args, Debug)]
#[command(after_help = "\
Examples:
  sheaf merge base.sheaf project.sheaf personal.sheaf -o flat.sheaf
  sheaf merge https://files.example.org/base.sheaf project.sheaf -o flat.sheaf -c xz:9

The result is what `sheaf ls -R BASE,LAYER,...` shows: later layers win,
whiteouts and opaque directories are applied and none is left in the image.
Directories take the attributes of the topmost layer holding them. Files
are packed as `sheaf build` packs a directory's (the same order, trained
dictionary and defaults), each layer's data read once.")]
pub struct MergeArgs {
    /// The layers, bottom first (files or URLs).
    #[arg(required = true, value_name = "IMAGE")]
    images: Vec<PathBuf>,
    /// The image to write.
    #[arg(short, long, value_name = "IMAGE")]
    output: PathBuf,
    #[command(flatten)]
    image: ImageArgs,
}

/// Run `sheaf merge`.
pub fn merge(
    a: MergeArgs,
    remote: &crate::util::RemoteArgs,
    io: &mut crate::Io<'_>,
) -> Result<i32> {
    let opts = a.image.options()?;
    let cache = stack_input::layer_options();
    // `merge A B` and `merge A,B` alike.
    let images = crate::util::split_layers(&a.images);
    let layers = images
        .iter()
        .map(|p| crate::util::open_image_with(p, remote, cache, |s| s).map(Arc::new))
        .collect::<Result<Vec<_>>>()?;
    let src = StackSource::new(Stack::new(layers));
    let names: Vec<String> = images.iter().map(|p| p.display().to_string()).collect();
    write_image(
        &Input::Entries(Arc::new(src)),
        &a.output,
        &opts,
        &a.image,
        serde_json::json!({ "layers": names }),
        io,
    )
}
