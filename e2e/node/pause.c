/* The e2e real node's pod sandbox ("pause") image: no registry serves registry.k8s.io/pause here.
 * Like the real one: PID 1 of the pod, sleeps in pause(), reaps zombies, exits 0 on SIGINT or
 * SIGTERM. Built static by e2e/node.sh. */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_exit_signal(int sig) { (void)sig; _exit(0); }
static void on_child(int sig) { (void)sig; while (waitpid(-1, NULL, WNOHANG) > 0) {} }

int main(void) {
  struct sigaction exit_action = {.sa_handler = on_exit_signal};
  struct sigaction child_action = {.sa_handler = on_child, .sa_flags = SA_NOCLDSTOP};
  if (sigaction(SIGINT, &exit_action, NULL) < 0 || sigaction(SIGTERM, &exit_action, NULL) < 0 ||
      sigaction(SIGCHLD, &child_action, NULL) < 0)
    return 1;
  for (;;) pause();
}
