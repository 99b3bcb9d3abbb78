//! `sheaf find`: metadata questions answered from the image itself (file
//! or URL), no mount, in find(1)'s language (`sheaf du` is in du.rs). The
//! engine (parsing, the walk, printing) is `sheaf_read::find`, shared with
//! the Python package; this file has the arguments and the command.

use crate::util::RemoteArgs;
use anyhow::Result;
use sheaf_read::find::FindError;
use std::ffi::OsString;
use std::path::PathBuf;

pub(crate) use sheaf_read::find::{local_time, name_or_id, now, start_path};

/// Arguments of `sheaf find`.
#[derive(clap::Args, Debug)]
#[command(after_help = concat!(
    "Expression (find(1) syntax and meaning):\n",
    "  tests      -name PAT  -iname PAT  -path PAT  -ipath PAT  -lname PAT  -ilname PAT  (shell patterns)\n",
    "             -type [fdlcbps]  -size [+-]N[cwbkMG]  -empty  -perm [-/]MODE (octal, or u+x,g=r)\n",
    "             -user NAME  -group NAME  -nouser  -nogroup  -uid N  -gid N  -links N  -inum N\n",
    "             -mtime N  -mmin N  -newer FILE  -true  -false  (N is [+-]N: more, less, exactly)\n",
    "  actions    -print (the default)  -print0  -ls  -printf FMT  -prune (do not enter)  -quit (stop)\n",
    "  options    -maxdepth N  -mindepth N  -depth (a directory after its entries)\n",
    "  operators  ( EXPR )  ! EXPR  EXPR [-a] EXPR  EXPR -o EXPR  EXPR , EXPR  (quote parentheses from the shell)\n",
    "\n",
    "-printf: %p %P %f %h %H %d %s %k %b %m %M %y %l %u %g %U %G %i %n %t %T@ %T+ %Tk (k: a strftime letter);\n",
    "\\n \\t \\0 %%; widths and precisions as %-20p %10s %.3f. An image keeps one time, the mtime:\n",
    "-atime, -ctime, -amin, -cmin, -anewer, -cnewer, %A and %C use it, as a mount shows it.\n",
    "\n",
    "Examples:\n",
    "  sheaf find data.sheaf / -name '*.nii.gz' -size +10M\n",
    "  sheaf find https://host/stack.sheaf /lib -type f -printf '%s %p\\n'\n",
    "  sheaf find img.sheaf /sub -maxdepth 1 -type d -print0 | xargs -0 ...\n",
    "  sheaf find src.sheaf \\( -name '*.c' -o -name '*.h' \\) -size +100k\n",
    "  sheaf find stack.sheaf -name __pycache__ -prune -o -name '*.py' -print\n",
    "  sheaf find stack.sheaf -type f -perm /o+w -ls    # world-writable files\n",
    "  sheaf find data.sheaf -type f -printf '%TY-%Tm-%Td %s %p\\n'"
))]
pub struct FindArgs {
    /// The image (file or URL), or a stack of layers BASE,LAYER,... (its
    /// merged tree; later layers win).
    image: PathBuf,
    /// [PATH] [EXPRESSION...]: where to start in the image (default /;
    /// relative paths start at the image's root and print as given), then
    /// the expression.
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "PATH] [EXPR"
    )]
    rest: Vec<OsString>,
}

/// `sheaf find`.
pub fn find(a: FindArgs, remote: &RemoteArgs, io: &mut crate::Io<'_>) -> Result<i32> {
    let (path, tokens) = sheaf_read::find::split_args(&a.rest);
    let e = sheaf_read::find::parse(tokens)?;
    let start = start_path(&path);
    let quote = io
        .stdout_is_tty()
        .then_some(crate::util::terminal_name as fn(&[u8]) -> String);
    let out = std::io::BufWriter::with_capacity(1 << 16, &mut *io.stdout);
    // One image, or the merged tree of a stack BASE,LAYER,...
    let found = match crate::util::stack_layers(&a.image) {
        Some(layers) => {
            let stack = crate::util::open_stack(&layers, remote)?;
            sheaf_read::find::run_stack(&stack, &start, &e, out, quote)
        }
        None => {
            let img = crate::util::open_image(&a.image, remote)?;
            sheaf_read::find::run(&img, &start, &e, out, quote)
        }
    };
    // The error names the path (and the image, where the image is at fault).
    match found {
        Ok(_) => Ok(0),
        Err(FindError::Walk(err)) => {
            Err(anyhow::Error::new(err).context(a.image.display().to_string()))
        }
        Err(err) => Err(err.into()),
    }
}
