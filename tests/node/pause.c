/* The pod sandbox's process for the local node (tests/node/node.sh): it holds the pod's
 * namespaces open, reaps the zombies of a shared PID namespace, and exits 0 on SIGINT or
 * SIGTERM. Built static, so its image needs nothing else. */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) {
  (void)sig;
  _exit(0);
}

static void reap(int sig) {
  (void)sig;
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
}

int main(void) {
  struct sigaction on_stop = {.sa_handler = stop};
  struct sigaction on_child = {.sa_handler = reap, .sa_flags = SA_NOCLDSTOP | SA_RESTART};
  if (sigaction(SIGINT, &on_stop, NULL) || sigaction(SIGTERM, &on_stop, NULL) ||
      sigaction(SIGCHLD, &on_child, NULL)) {
    return 1;
  }
  for (;;) {
    pause();
  }
}
