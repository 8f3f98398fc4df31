//! The `kdctl` binary's contract with scripts: its help, its exit codes and its messages for
//! bad input, before it reaches any server.

use std::process::{Command, Output};

fn kdctl(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kdctl"))
        .args(args)
        .env_remove("KD_TLS_CA_FILE")
        .env_remove("KD_INSECURE")
        .env("KUBECONFIG", "/nonexistent/kubeconfig")
        .output()
        .expect("run kdctl")
}

#[test]
fn help_names_every_command_and_the_exit_codes() {
    let out = kdctl(&["--help"]);
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "status",
        "owner",
        "drain",
        "version",
        "Exit status: 0",
        "/kube-dispatch/status",
        "--output",
    ] {
        assert!(help.contains(needle), "--help lacks {needle:?}:\n{help}");
    }
}

#[test]
fn bad_usage_exits_2_and_an_unreachable_cluster_exits_1_with_what_failed() {
    let out = kdctl(&["owner", "configmaps"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let out = kdctl(&["status", "-o", "yaml"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");

    // No CA given: it is looked for in the cluster, which this kubeconfig does not reach.
    let out = kdctl(&["status"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.starts_with("kdctl: ") && err.contains("/nonexistent/kubeconfig"),
        "{err}"
    );

    let out = kdctl(&["--insecure", "--service-account", "kdctl", "status"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--service-account must be NAMESPACE/NAME"),
        "{err}"
    );
}

/// KUBECONFIG is read as kubectl reads it: empty, it is unset (a shell's `export KUBECONFIG=`
/// once made every command a usage error, `--kubeconfig` given or not), and the flag wins.
#[test]
fn an_empty_kubeconfig_variable_is_unset_and_the_flag_wins() {
    let home = std::env::temp_dir().join(format!("kdctl-home-{}", std::process::id()));
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_kdctl"))
            .args(args)
            .env_remove("KD_TLS_CA_FILE")
            .env_remove("KD_INSECURE")
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env("KUBECONFIG", "")
            .env("HOME", &home)
            .output()
            .expect("run kdctl")
    };
    // Unset: the next place looked at is ~/.kube/config, which this HOME does not have.
    let out = run(&["status"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(".kube/config"), "{err}");
    // The flag, with the variable empty beside it.
    let out = run(&["--kubeconfig", "/nonexistent/flag-kubeconfig", "status"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/nonexistent/flag-kubeconfig"), "{err}");
}
