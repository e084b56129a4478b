"""SmoothAdv: the PGD attack on the soft smoothed classifier and its radius."""

import torch

from smoothsk.training import FixedSigmaTraining, SmoothAdv

from training_support import ModeRecorder, digits_net, training_digits


def test_smoothadv_stays_within_epsilon_and_increases_loss():
    X, y = training_digits()
    net = digits_net(X, y, training=FixedSigmaTraining(0.25), max_epochs=3)
    X_t, y_t = torch.from_numpy(X[:60]), torch.as_tensor(y[:60])
    sigma = torch.linspace(0.05, 1.0, 60)
    for objective in (SmoothAdv(epsilon=0.3, steps=3, num_noise=2), SmoothAdv("adaptive", steps=3, num_noise=2)):
        epsilon = objective.attack_radius(net, sigma)
        expected = 2 * sigma if objective.epsilon == "adaptive" else torch.full_like(sigma, 0.3)
        torch.testing.assert_close(epsilon, expected)
        noise = torch.randn((2 * 60, 1, 8, 8)) * sigma.repeat(2)[:, None, None, None]
        X_adv = objective.attack(net, X_t, y_t, noise, epsilon)
        distance = (X_adv - X_t).flatten(1).norm(dim=1)
        assert torch.all(distance <= epsilon * (1 + 1e-5))
        # The last step ends on the sphere unless the gradient vanished.
        assert torch.mean((distance >= 0.99 * epsilon).float()) > 0.9

        def soft_loss(inputs, noise=noise):
            with torch.no_grad():
                logits = net.module_(inputs.repeat(2, 1, 1, 1) + noise)
            probabilities = torch.softmax(logits, dim=1).view(2, 60, -1).mean(dim=0)
            return -torch.log(probabilities.gather(1, y_t[:, None])).sum()

        assert soft_loss(X_adv) > soft_loss(X_t)


def test_smoothadv_epsilon_warmup():
    X, y = training_digits()
    net = digits_net(X, y, training=FixedSigmaTraining(0.25), max_epochs=2)  # now in epoch index 1
    sigma = torch.full((5,), 0.25)
    epsilon = SmoothAdv(epsilon=1.0, warmup_epochs=4).attack_radius(net, sigma)
    torch.testing.assert_close(epsilon, torch.full((5,), 0.5))
    assert torch.all(SmoothAdv(epsilon=1.0, warmup_epochs=2).attack_radius(net, sigma) == 1.0)


def test_smoothadv_attacks_in_eval_mode_and_trains_in_train_mode():
    X, y = training_digits()
    net = digits_net(X, y, module=ModeRecorder)
    net.module_.train()
    net.module_.modes.clear()
    SmoothAdv(epsilon=0.5, steps=3, num_noise=2).loss(net, torch.from_numpy(X[:10]), torch.as_tensor(y[:10]),
                                                     torch.full((10,), 0.25))
    assert net.module_.modes == [False, False, False, True]
    assert net.module_.training
