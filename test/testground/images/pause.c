/* pause: the sandbox process of every pod on the test ground's real node. It holds the pod's
 * namespaces, reaps the children it inherits, and exits on SIGTERM or SIGINT. Built with
 * gcc -static by the test ground (no registry: the pause image is made on this machine). */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) { (void)sig; _exit(0); }

static void reap(int sig) {
	(void)sig;
	while (waitpid(-1, NULL, WNOHANG) > 0) {
	}
}

int main(void) {
	signal(SIGTERM, stop);
	signal(SIGINT, stop);
	signal(SIGCHLD, reap);
	for (;;) {
		pause();
	}
}
