//! `kandev-operator`: the controller binary (and the CRD generator).

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "kandev-operator",
    version,
    about = "Keeps AI coding-agent sessions alive across pod loss: lost agents are marked NeedsResume and restored over ACP when a resume is requested."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the TaskSession and ExecutorRunning CRDs as one multi-document YAML stream
    /// (the same content as the files under crds/).
    Crd {
        /// Write one file per CRD (<plural>.kandev.dev.yaml) into this directory instead.
        #[arg(long, value_name = "DIR")]
        output_dir: Option<std::path::PathBuf>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Crd { output_dir } => match print_crds(output_dir.as_deref()) {
            Ok(()) => ExitCode::SUCCESS,
            Err(err) => {
                eprintln!("error: {err}");
                ExitCode::FAILURE
            }
        },
    }
}

fn print_crds(output_dir: Option<&std::path::Path>) -> Result<(), String> {
    let files = kandev_operator::api::crd_files()
        .map_err(|e| format!("rendering the CRDs as YAML: {e}"))?;
    for file in files {
        match output_dir {
            Some(dir) => {
                let path = dir.join(&file.file_name);
                std::fs::write(&path, &file.yaml)
                    .map_err(|e| format!("writing {}: {e}", path.display()))?;
                eprintln!("wrote {}", path.display());
            }
            None => print!("---\n{}", file.yaml),
        }
    }
    Ok(())
}
