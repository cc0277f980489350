// Does a loader thread stall serving threads through the process's memory-map lock?
// Two threads hog both cores at normal priority; the main thread maps, touches and unmaps
// 1 MiB every 1 ms for 4 s and prints its worst time. Mode 0: nothing else; 1: a thread of
// the idle class touches fresh pages of a 3 GB mapping (as a model load does); 2: the same
// after pre-faulting it with MADV_POPULATE_WRITE at normal priority, 64 MiB at a time.
// Build and run: cc -O2 -pthread -o /tmp/mmap_lock bench/mmap_lock.c && for m in 0 1 2; do /tmp/mmap_lock $m; done
// (figures in README.md, the model repository section).
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include <stdatomic.h>
static atomic_int stop;
static int mode; // 0: no loader, 1: loader faults (memset fresh), 2: loader prefaulted with POPULATE_WRITE then memset
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static void* hog(void*a){volatile unsigned long x=0;while(!atomic_load(&stop)){for(int i=0;i<100000;i++)x+=i;}return 0;}
static void* loader(void*a){
  struct sched_param p={0}; sched_setscheduler(0,SCHED_IDLE,&p);
  size_t n=(size_t)3<<30;
  char*b=mmap(0,n,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS,-1,0);
  if(mode==2){ // populate in chunks at normal priority
    struct sched_param q={0}; sched_setscheduler(0,SCHED_OTHER,&q);
    for(size_t o=0;o<n;o+=64<<20) madvise(b+o,64<<20,23/*MADV_POPULATE_WRITE*/);
    sched_setscheduler(0,SCHED_IDLE,&p);
  }
  double t=now();
  for(size_t o=0;o<n&&!atomic_load(&stop);o+=4096) b[o]=1;
  fprintf(stderr,"loader touched in %.2f s\n",now()-t);
  munmap(b,n);
  return 0;
}
int main(int argc,char**argv){
  mode=atoi(argv[1]);
  pthread_t h[2],l;
  for(int i=0;i<2;i++)pthread_create(&h[i],0,hog,0);
  if(mode)pthread_create(&l,0,loader,0);
  double worst=0,sum=0;int n=0;double t0=now();
  while(now()-t0<4){
    double t=now();
    void*m=mmap(0,1<<20,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS,-1,0);
    ((char*)m)[0]=1;
    munmap(m,1<<20);
    double d=now()-t; if(d>worst)worst=d; sum+=d;n++;
    usleep(1000);
  }
  atomic_store(&stop,1);
  printf("mode %d: %d mmap+fault+munmap, mean %.1f us, worst %.2f ms\n",mode,n,sum/n*1e6,worst*1e3);
  for(int i=0;i<2;i++)pthread_join(h[i],0);
  if(mode)pthread_join(l,0);
}
