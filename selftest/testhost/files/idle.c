/* stand-in for a model server (ollama, llama-server, vllm) in the sparkgate test host: a real,
 * long-running process under the server's name and argv that does nothing until it is killed. */
#include <unistd.h>

int main(void)
{
    for (;;)
        pause();
}
