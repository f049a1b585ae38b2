//! Prints the CustomResourceDefinitions of ax as YAML, or writes one file each into a directory.

use ax::api::{AxCron, AxDag, AxQueue, AxTask, AxTaskTemplate};
use kube::CustomResourceExt;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let crds = [
        ("axtasks.yaml", AxTask::crd()),
        ("axdags.yaml", AxDag::crd()),
        ("axqueues.yaml", AxQueue::crd()),
        ("axcrons.yaml", AxCron::crd()),
        ("axtasktemplates.yaml", AxTaskTemplate::crd()),
    ];
    match std::env::args().nth(1) {
        Some(dir) => {
            for (file, crd) in crds {
                let path = std::path::Path::new(&dir).join(file);
                std::fs::write(&path, ax::yaml::to_string(&crd)?)?;
            }
        }
        None => {
            for (_, crd) in crds {
                print!("---\n{}", ax::yaml::to_string(&crd)?);
            }
        }
    }
    Ok(())
}
