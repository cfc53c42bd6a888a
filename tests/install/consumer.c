/* A program outside the kdloss tree, built against an installed kdloss (tests/install/run.sh):
 * KL(t || exp(y)) with batchmean reduction and its gradient on a 3 x 5 input, checked against the
 * same formulas evaluated here in double. Exits 0 on agreement, 1 on any mismatch or error. */
#include <kdloss.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

enum { BT = 3, V = 5 };

int main(void) {
    float y[BT * V], t[BT * V], grad[BT * V], loss = -1.0f;
    double want = 0.0;
    for (int r = 0; r < BT; r++) {
        /* y: log_softmax of a fixed row of logits; t: a softmax of other logits, with one 0. */
        double zy[V], zt[V], my = 0.0, mt = 0.0;
        for (int c = 0; c < V; c++) {
            zy[c] = 0.7 * c - 0.9 * r + 0.3 * ((c * 7 + r * 3) % 5);
            zt[c] = 1.1 * ((c + 2 * r) % V) - 0.5 * c;
            my += exp(zy[c]);
            mt += exp(zt[c]);
        }
        for (int c = 0; c < V; c++) {
            y[r * V + c] = (float)(zy[c] - log(my));
            t[r * V + c] = (r == 1 && c == 2) ? 0.0f : (float)(exp(zt[c]) / mt);
        }
    }
    for (int i = 0; i < BT * V; i++)  /* the reference reads the fp32 inputs the library reads */
        if (t[i] > 0.0f) want += (double)t[i] * (log((double)t[i]) - (double)y[i]);
    want /= BT;

    kdloss_kl_params p;
    kdloss_kl_params_default(&p);
    p.reduction = KDLOSS_REDUCTION_BATCHMEAN;
    kdloss_cmat in = {y, KDLOSS_F32, 0}, tg = {t, KDLOSS_F32, 0};
    kdloss_mat none = {NULL, KDLOSS_F32, 0}, g = {grad, KDLOSS_F32, 0};
    kdloss_status st = kdloss_kl_div(&p, BT, V, in, tg, &loss, NULL, none, g);
    if (st != KDLOSS_OK) {
        fprintf(stderr, "consumer: kdloss_kl_div: %s\n", kdloss_status_string(st));
        return 1;
    }
    int bad = 0;
    if (!(fabs(loss - want) <= 1e-6 * fabs(want) + 1e-7)) {
        fprintf(stderr, "consumer: loss %.9g, expected %.9g\n", loss, want);
        bad = 1;
    }
    for (int i = 0; i < BT * V; i++) {
        double gw = -(double)t[i] / BT; /* dloss/dy = -t times the batchmean scale 1/BT */
        if (!(fabs(grad[i] - gw) <= 1e-6 * fabs(gw) + 1e-9)) {
            fprintf(stderr, "consumer: grad[%d] %.9g, expected %.9g\n", i, grad[i], gw);
            bad = 1;
        }
    }
    /* The installed header and the installed library must be the same release. */
    char hv[32];
    snprintf(hv, sizeof hv, "%d.%d.%d", KDLOSS_VERSION_MAJOR, KDLOSS_VERSION_MINOR, KDLOSS_VERSION_PATCH);
    if (strcmp(hv, kdloss_version()) != 0) {
        fprintf(stderr, "consumer: header says %s, library says %s\n", hv, kdloss_version());
        bad = 1;
    }
    printf("consumer: kdloss %s, kl_div batchmean loss %.7g (expected %.7g): %s\n", kdloss_version(),
           loss, want, bad ? "MISMATCH" : "ok");
    return bad;
}
