//! The `kdctl` binary's contract with scripts: its help, its exit codes and its messages for
//! bad input, before it reaches any server.

use std::{
    ffi::OsStr,
    process::{Command, Output},
};

fn kdctl(args: &[&str]) -> Output {
    kdctl_with(&[("KUBECONFIG", "/nonexistent/kubeconfig".as_ref())], args)
}

/// kdctl with none of this machine's settings for it (nor a pod's in-cluster configuration),
/// and `env` set.
fn kdctl_with(env: &[(&str, &OsStr)], args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kdctl"))
        .args(args)
        .env_remove("KD_TLS_CA_FILE")
        .env_remove("KD_INSECURE")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .envs(env.iter().copied())
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
/// once made every command a usage error, `--kubeconfig` given or not), a list of files is
/// merged (it was once read as one path), and the flag wins.
#[test]
fn kubeconfig_is_read_as_kubectl_reads_it() {
    let home = std::env::temp_dir().join(format!("kdctl-home-{}", std::process::id()));
    std::fs::create_dir_all(&home).expect("a scratch HOME");
    let run = |kubeconfig: &OsStr, args: &[&str]| {
        kdctl_with(
            &[("KUBECONFIG", kubeconfig), ("HOME", home.as_os_str())],
            args,
        )
    };
    let stderr = |out: &Output| String::from_utf8_lossy(&out.stderr).into_owned();

    // Empty: unset, so the next place looked at is this HOME's ~/.kube/config, which it lacks.
    let out = run("".as_ref(), &["status"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let missing = home.join(".kube/config");
    assert!(
        stderr(&out).contains(&*missing.to_string_lossy()),
        "{out:?}"
    );

    // The flag, with the variable empty beside it.
    let out = run(
        "".as_ref(),
        &["--kubeconfig", "/nonexistent/flag-kubeconfig", "status"],
    );
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        stderr(&out).contains("/nonexistent/flag-kubeconfig"),
        "{out:?}"
    );

    // A list: the context in one file, its cluster and user in another. Merged, kdctl gets as
    // far as the cluster (nothing listens there), looking for the dispatchers' CA.
    let (contexts, clusters) = (home.join("contexts.yaml"), home.join("clusters.yaml"));
    std::fs::write(
        &contexts,
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n\
         contexts: [{name: c, context: {cluster: k, user: u}}]\n",
    )
    .expect("write a kubeconfig");
    std::fs::write(
        &clusters,
        "apiVersion: v1\nkind: Config\n\
         clusters: [{name: k, cluster: {server: 'http://127.0.0.1:9'}}]\n\
         users: [{name: u, user: {token: t}}]\n",
    )
    .expect("write a kubeconfig");
    let list = std::env::join_paths([&contexts, &clusters]).expect("a path list");
    let out = run(&list, &["status"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(stderr(&out).contains("the tier's CA bundle"), "{out:?}");
    assert!(stderr(&out).contains("Connection refused"), "{out:?}");

    // A list naming a file that is not there is an error, not a fall back to another config.
    let list = std::env::join_paths([&contexts, &home.join("absent.yaml")]).expect("a list");
    let out = run(&list, &["status"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(stderr(&out).contains("cannot read KUBECONFIG"), "{out:?}");
    std::fs::remove_dir_all(&home).ok();
}
